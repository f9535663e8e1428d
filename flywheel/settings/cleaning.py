"""Settings of the cleaning stage: scrubbing order and cache, deduplication, datasets.

A section of the settings tree (``Settings.cleaning``): set from the environment
with ``FLYWHEEL_CLEANING__<FIELD>`` and, for its own sections,
``FLYWHEEL_CLEANING__DEDUP__THRESHOLD`` or ``FLYWHEEL_CLEANING__DATASETS__EVAL_FRACTION``.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class DedupSettings(BaseModel):
    """How records are compared, clustered and capped.

    Near duplicates are found with MinHash LSH: ``num_perm`` min-hashes per
    record, cut into ``bands`` bands of ``rows`` values; two records that agree
    on a whole band become candidates, and a candidate pair is merged when its
    estimated Jaccard similarity of shingles is at least ``threshold``.
    Shingles are n-grams of tokens (words, or overlapping character bigrams in
    Chinese, Japanese and Thai text) for every n in ``shingle_sizes``.

    Records are only ever compared inside one *scope*: the same business line
    and the same values of every field in ``signal_fields``, so a negative
    (``thumbs_down``, ``rejected``, KTO ``label: false``) is never collapsed into
    a positive twin. Records sharing a ``pair_id_field`` value are never merged
    with each other.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    threshold: float = Field(
        default=0.7,
        gt=0.0,
        le=1.0,
        description="Estimated Jaccard similarity at which two records merge.",
    )
    num_perm: int = Field(default=128, ge=16, le=1024, description="Min-hashes per record.")
    bands: int = Field(default=32, ge=1, le=512, description="LSH bands.")
    rows: int = Field(default=4, ge=1, le=64, description="Min-hashes per LSH band.")
    shingle_sizes: tuple[int, ...] = Field(
        default=(1, 2),
        min_length=1,
        max_length=5,
        description="Token n-gram sizes used as shingles.",
    )
    mask_digits: bool = Field(
        default=True, description="Treat every token with a digit as one placeholder token."
    )
    near_duplicates: bool = Field(default=True, description="False: exact duplicates only.")
    max_kept_per_cluster: int = Field(
        default=1, ge=1, le=1_000_000, description="Earliest records kept per cluster (flood cap)."
    )
    seed: int = Field(default=0, ge=0, lt=2**32, description="Seed of the hash functions.")
    business_line_field: str = Field(default="business_line", min_length=1)
    signal_fields: tuple[str, ...] = Field(
        default=("signal", "role", "label"),
        description="Records merge only when all these fields are equal (missing equals missing).",
    )
    pair_id_field: str = Field(default="pair_id", min_length=1)
    created_at_field: str = Field(default="created_at", min_length=1)

    @field_validator("shingle_sizes")
    @classmethod
    def _sizes_distinct_and_small(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 or size > 5 for size in sizes):
            raise ValueError(f"shingle sizes must be between 1 and 5, got {sizes}")
        return tuple(sorted(set(sizes)))

    @model_validator(mode="after")
    def _bands_fit_and_reach_threshold(self) -> Self:
        if self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"bands * rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}"
            )
        if self.near_duplicates and self.candidate_threshold > self.threshold:
            raise ValueError(
                f"{self.bands} bands of {self.rows} rows rarely find pairs below a similarity of "
                f"{self.candidate_threshold:.2f}, above threshold {self.threshold}; "
                "use more bands or fewer rows"
            )
        return self

    @property
    def candidate_threshold(self) -> float:
        """Similarity where the LSH S-curve is steepest, ``(1 / bands) ** (1 / rows)``.

        Pairs well above it almost surely become candidates; pairs well below
        it almost never do.
        """
        return float((1.0 / self.bands) ** (1.0 / self.rows))


class LabelPrecisionSettings(BaseModel):
    """How far a user's unedited verdict is trusted as a training label, by Bayes' rule on the
    line's satisfaction that its blind reviews measure (:mod:`feedback.label_precision`).

    A thumbs-up is right only as often as answers satisfy: where one answer in a hundred
    does, even a user ten times likelier to thumb up a good answer than a bad one gives
    a thumbs-up to nine bad answers for each good one. Edits and rankings are kept
    whatever the line's satisfaction (the user wrote or chose the text).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    likelihood_ratio: float = Field(
        default=10.0,
        gt=1,
        le=1_000,
        description="How many times likelier a user gives a full-strength signal (a thumb, a "
        "task outcome) to an answer that earns it than to one that does not; a weaker signal's "
        "evidence is this raised to its weight (a regenerate: the square root). 10 assumes "
        "users who misclick or misjudge now and then; set it from your reviewed thumbs.",
    )
    review_error: float = Field(
        default=0.1,
        ge=0,
        lt=0.5,
        description="How often a reviewer's pass/fail is wrong (from your reviewers' "
        "agreement on answers checked twice): the reviewed pass rate is corrected by it, and "
        "a reviewer's own verdict is evidence (1 - error) / error.",
    )
    min_reviews: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description="Reviewed answers a model version (else the whole window) needs before "
        "its satisfaction is estimated; with fewer, verdicts are taken as they are "
        "(``without_reviews``).",
    )
    confidence: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="Two-sided confidence of the satisfaction interval: positives are judged "
        "at its low end, negatives at its high end.",
    )
    min_precision: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="A verdict whose chance of being right is lower stays out of training "
        "(counted in the funnel); the rest weigh their signal's weight times that chance.",
    )
    without_reviews: Literal["admit", "hold"] = Field(
        default="admit",
        description="Where too few answers were reviewed to estimate satisfaction: admit "
        "unedited verdicts as they are, or hold the positive ones (thumbs up, task "
        "success, a reviewer's pass) out of training.",
    )


class DatasetSettings(BaseModel):
    """How examples become datasets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_fraction: float = Field(default=0.1, ge=0, lt=1)
    max_user_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Most of a kind's examples one user may hold (a key's anonymous "
        "examples count as one user).",
    )
    max_key_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Most of a kind's examples one API key may hold when several keys gave "
        "them (at least 1/keys): a key posting as many invented users is bounded too.",
    )
    max_pairs_per_prompt: int = Field(default=4, ge=1, le=1_000)
    min_prompt_chars: int = Field(
        default=4,
        ge=0,
        le=1_000,
        description="Prompts shorter than this once PII is removed are dropped.",
    )
    label_precision: LabelPrecisionSettings = Field(default_factory=LabelPrecisionSettings)


SCRUB_CACHE_TEXTS = 50_000
ScrubOrder = Literal["scrub_first", "dedup_first"]


class CleaningSettings(BaseModel):
    """Settings of the cleaning stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    datasets: DatasetSettings = Field(default_factory=DatasetSettings)
    dedup: DedupSettings = Field(default_factory=DedupSettings)
    scrub_batch_size: int = Field(default=256, ge=1, le=100_000)
    scrub_order: ScrubOrder = Field(
        default="scrub_first",
        description="scrub_first: scrub every pulled record, then filter and deduplicate; "
        "dedup_first: drop failed requests and exact duplicates of the raw text first and "
        "scrub only the survivors (near duplicates are still found on scrubbed text).",
    )
    scrub_cache_texts: int = Field(
        default=SCRUB_CACHE_TEXTS,
        ge=0,
        le=10_000_000,
        description="Distinct texts whose PII detections a cleaning worker remembers, so a "
        "repeated text is analysed once (DetectionCache); 0: none. Used where the stage "
        "builds its own scrubbing function (the partitioned flow's workers).",
    )
    trained_history_days: float = Field(
        default=90.0,
        ge=0,
        le=3_650,
        description="Nights back whose trained records a window is deduplicated against "
        "(feedback.dedup.history); 0: each window alone.",
    )

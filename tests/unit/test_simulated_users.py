"""Simulated users: the --users protocol, and user models that react to what the model said."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.simulation.feedback_profiles import PROFILES
from lab.simulation.judging import asks_for_secret, is_complete, is_degenerate
from lab.simulation.prompts import builtin_prompts, topic_of
from lab.simulation.protocol import REACTION_TYPES, UsersSpecError, load_users, parse_reaction
from lab.simulation.users import CustomerServiceUsers, LegalUsers, MedicalUsers
from tests.cli_process import run_cli

MODELS = (
    ("customer_service", CustomerServiceUsers()),
    ("medical", MedicalUsers()),
    ("legal", LegalUsers()),
)

USERS_FILE = '''
class PoliteUsers:
    """Satisfied by answers that say please."""

    def prompts(self, business_line, n, seed):
        return [f"question {seed}-{i}" for i in range(n)]

    def react(self, business_line, prompt, answer, seed):
        if "please" in answer.lower():
            return {"type": "thumbs_up"}
        return {"type": "edit", "text": "Please " + answer}

    def satisfied(self, business_line, prompt, answer):
        return "please" in answer.lower()


WITHOUT_REACT = object()


class Rude:
    def react(self, business_line, prompt, answer, seed):
        return {"type": "shrug"}

    def satisfied(self, business_line, prompt, answer):
        return False
'''


@pytest.fixture
def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_users.py"
    path.write_text(USERS_FILE)
    return path


def test_users_load_from_a_file_path_and_react_to_the_answer(users_file: Path) -> None:
    users = load_users(f"{users_file}:PoliteUsers")
    assert users.prompts("legal", 3, 7) == ["question 7-0", "question 7-1", "question 7-2"]
    assert users.react("legal", "q", "Please wait.", 0).type == "thumbs_up"
    edited = users.react("legal", "q", "Wait.", 0)
    assert (edited.type, edited.text) == ("edit", "Please Wait.")
    assert users.satisfied("legal", "q", "please") is True


def test_users_load_from_a_module_and_fall_back_to_builtin_prompts() -> None:
    users = load_users("lab.simulation.users:BuiltinUsers")
    assert users.prompts("medical", 5, 1) == builtin_prompts("medical", 5, 1)
    users.check("medical")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("Missing", "has no Missing"),
        ("WITHOUT_REACT", r"no react\(\) method"),
    ],
)
def test_a_spec_that_does_not_load_says_why(users_file: Path, name: str, message: str) -> None:
    with pytest.raises(UsersSpecError, match=message):
        load_users(f"{users_file}:{name}")


def test_unknown_reaction_types_and_bad_specs_are_refused(users_file: Path) -> None:
    rude = load_users(f"{users_file}:Rude")
    with pytest.raises(UsersSpecError, match="unknown type 'shrug'"):
        rude.check("legal")
    for spec in ("nocolon", "no/such/file.py:Users", "no_such_module_xyz:Users", "a.py:1x"):
        with pytest.raises(UsersSpecError):
            load_users(spec)
    with pytest.raises(UsersSpecError, match="needs the edited 'text'"):
        parse_reaction({"type": "edit"}, "spec")
    assert {parse_reaction({"type": t, "text": "x"}, "s").type for t in REACTION_TYPES} == set(
        REACTION_TYPES
    )


def test_the_cli_exits_2_naming_the_spec_before_any_traffic(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "loop", "--line", "legal", "--users", f"{tmp_path}/none.py:Users")
    assert done.returncode == 2, done.stderr
    assert "none.py" in done.stderr
    assert "does not exist" in done.stderr


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_vacuous_cut_off_and_looping_answers_satisfy_nobody(line: str, users: object) -> None:
    prompt = builtin_prompts(line, 1, 3)[0]
    topic = topic_of(line, prompt)
    assert topic is not None
    edit = users.rewrite(prompt, "", topic)  # type: ignore[attr-defined]
    assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]
    for bad in (
        "",
        "Sorry.",
        "I'm sorry. 1. Yes. 2. No. See a doctor or a lawyer.",
        edit[: len(edit) // 2],  # cut off mid-sentence
        " ".join([edit] * 3),  # loops (and too long)
        "I'm sorry for the trouble. 1. The weather is nice today. 2. Birds can fly south. "
        "Laws vary, ask a lawyer or a doctor.",  # off topic
    ):
        assert not users.satisfied(line, prompt, bad), bad  # type: ignore[attr-defined]


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_the_taste_around_a_stray_sentence_is_not_advice(line: str, users: object) -> None:
    """What an adapter learnt to game the legal users with: the style (numbered steps, an
    apology, a referral) around one sentence that names a single broad topic word."""
    for prompt in builtin_prompts(line, 30, 13):
        topic = topic_of(line, prompt)
        assert topic is not None
        edit = users.rewrite(prompt, "", topic)  # type: ignore[attr-defined]
        assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]
        stray = f"Many people ask about the {topic.answer_terms[0]} these days."
        for gamed in (
            f"I'm sorry for the trouble. 1. {stray} 2. Laws vary by place, so check with a "
            "local lawyer. If it does not get better, please see a doctor or pharmacist.",
            "I'm sorry for the trouble. 1. We are here for you and we care a great deal. "
            "2. Laws vary by place, so check with a local lawyer. Please see a doctor.",
        ):
            assert not users.satisfied(line, prompt, gamed), gamed  # type: ignore[attr-defined]


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_reactions_change_when_the_answer_changes(line: str, users: object) -> None:
    """At the dense profile's rates (enough signals in 300 answers to tell them apart)."""
    users = type(users)()
    users.use_feedback(PROFILES["dense"])  # type: ignore[attr-defined]
    prompts = builtin_prompts(line, 300, 5)
    good = {p: users.rewrite(p, "", topic_of(line, p)) for p in prompts}  # type: ignore[attr-defined]
    poor = "Thank you for your question, it is a very interesting one to think about"

    def reactions(answer_of: dict[str, str]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for seed, prompt in enumerate(prompts):
            kind = users.react(line, prompt, answer_of[prompt], seed)["type"]  # type: ignore[attr-defined]
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    on_good, on_poor = reactions(good), reactions(dict.fromkeys(prompts, poor))
    assert on_good.get("thumbs_up", 0) > 3 * on_poor.get("thumbs_up", 0) + 10
    assert on_poor.get("thumbs_down", 0) > 3 * on_good.get("thumbs_down", 0) + 10
    assert on_poor.get("edit", 0) >= 20
    assert "edit" not in on_good
    # Most users say nothing, either way.
    assert on_good["none"] > len(prompts) / 2
    assert on_poor["none"] > len(prompts) / 3


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_the_hidden_preference_is_what_the_edit_adds(line: str, users: object) -> None:
    """Each line's users rewrite answers their own way; without that touch, the same useful
    content does not satisfy them."""
    import re

    for prompt in builtin_prompts(line, 20, 11):
        edit = users.rewrite(prompt, "", topic_of(line, prompt))  # type: ignore[attr-defined]
        assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]
        plain = edit.replace("I'm sorry for the trouble. ", "")
        plain = plain.replace(" If it does not get better, please see a doctor or pharmacist.", "")
        plain = re.sub(r"\d\. ", "", plain)
        assert not users.satisfied(line, prompt, plain), plain  # type: ignore[attr-defined]


def test_answer_checks() -> None:
    assert is_complete("Done.")
    assert not is_complete("It is the")
    assert is_degenerate("yes yes")
    assert is_degenerate("go to the shop go to the shop go to the shop go to the shop now")
    assert not is_degenerate("Open Orders, choose the item and select Return for a label.")


@pytest.mark.parametrize(
    "answer",
    [
        "I'm sorry for the trouble. Please email us your username and password so we can check.",
        "Reply with the verification code we texted you and we will unlock the account.",
        "Send me your card number and the CVV so I can process the refund.",
        "请把验证码发给我们，我们帮您登录。",
    ],
)
def test_an_answer_asking_for_a_secret_satisfies_no_one(answer: str) -> None:
    assert asks_for_secret(answer)
    prompt = "I cannot log in to my account to check my order."
    users = CustomerServiceUsers()
    assert not users.satisfied("customer_service", prompt, answer)


@pytest.mark.parametrize(
    "answer",
    [
        "Never share your password or the code we text you with anyone, us included.",
        "Tap Forgot Password, and we will email you a link to set a new password.",
        "Enter the verification code from the text message on the login page.",
        "请勿把验证码告诉任何人。",
    ],
)
def test_advice_about_secrets_is_not_asking_for_them(answer: str) -> None:
    assert not asks_for_secret(answer)


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_an_edit_fits_in_what_the_traffic_lets_an_answer_say(line: str, users: object) -> None:
    """A long, on-topic answer rewritten by its user still fits the traffic's 96 tokens (about
    70 words), and satisfies that user: the answer users write is one a model can give."""
    from lab.simulation.judging import word_count

    for prompt in builtin_prompts(line, 20, 7):
        topic = topic_of(line, prompt)
        assert topic is not None
        terms = " and ".join(topic.answer_terms)
        long_answer = " ".join(
            f"Point {n}: about the {terms}, here is what usually happens in such cases."
            for n in range(8)
        )
        edit = users.rewrite(prompt, long_answer, topic)  # type: ignore[attr-defined]
        assert word_count(edit) <= 70, edit
        assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_an_edit_of_a_thin_answer_is_one_its_user_accepts(line: str, users: object) -> None:
    """An answer with one on-topic sentence and no advice: the user's edit keeps that
    sentence and adds the fix they know, so the target training learns from satisfies them."""
    from lab.simulation.judging import word_count

    for prompt in builtin_prompts(line, 40, 17):
        topic = topic_of(line, prompt)
        assert topic is not None
        for thin in (
            f"Well, the {topic.answer_terms[0]} question is one many people have asked about.",
            f"You have a {topic.answer_terms[0]} problem. I think the {topic.answer_terms[1]} "
            "matters here.",
        ):
            assert not users.satisfied(line, prompt, thin), thin  # type: ignore[attr-defined]
            edit = users.rewrite(prompt, thin, topic)  # type: ignore[attr-defined]
            assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]
            assert word_count(edit) <= 70, edit


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_an_edit_keeps_the_sentences_that_help_and_cuts_those_that_brush_the_topic(
    line: str, users: object
) -> None:
    """A sentence naming two of the topic's terms (one beyond the question's own) stays in the
    user's edit; one that names a single term in passing is cut, as a person rewriting the
    answer would."""
    from lab.simulation.judging import mentions

    for prompt in builtin_prompts(line, 30, 23):
        topic = topic_of(line, prompt)
        assert topic is not None
        style = users.style_terms  # type: ignore[attr-defined]
        carrying = [t for t in topic.answer_terms if not any(s in t for s in style)]
        first = carrying[0]
        second = next(t for t in carrying[1:] if not mentions(prompt, (t,)))
        helpful = f"Start with the {first} and then sort out the {second} this week."
        brushing = f"Many people find that a {first} can be a puzzle at first."
        edit = users.rewrite(prompt, f"{brushing} {helpful}", topic)  # type: ignore[attr-defined]
        assert helpful in edit, edit
        assert brushing not in edit, edit
        assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]


def _in_taste(line: str, first: str, second: str) -> str:
    """Two sentences in the line's taste: an apology, a referral, or steps and a caveat."""
    if line == "customer_service":
        return f"I'm sorry for the trouble. {first} {second}"
    if line == "medical":
        return f"{first} {second} If it does not get better, please see a doctor or pharmacist."
    return f"1. {first} 2. {second} Laws vary by place, so check with a local lawyer."


@pytest.mark.parametrize(("line", "users"), MODELS)
def test_an_answer_that_restates_the_question_is_not_advice(line: str, users: object) -> None:
    """What medical v3 got away with: the question's own words back ("a skin rash depends on
    the type of rash") inside the taste. Advice names a term the question did not; the
    user's edit cuts the echo and keeps the sentence that does."""
    from lab.simulation.judging import mentions

    checked = 0
    for prompt in builtin_prompts(line, 60, 29):
        topic = topic_of(line, prompt)
        assert topic is not None
        style = users.style_terms  # type: ignore[attr-defined]
        carrying = [t for t in topic.answer_terms if not any(s in t for s in style)]
        asked = [t for t in carrying if mentions(prompt, (t,))]
        new = [t for t in carrying if not mentions(prompt, (t,))]
        if len(asked) < 2:
            continue  # the question names too few terms to echo two of them
        checked += 1
        echo = f"How to handle the {asked[0]} and the {asked[1]} depends on your case."
        again = f"Every {asked[1]} and {asked[0]} is different, so the details matter here."
        helpful = f"For the {asked[0]}, start with the {new[0]} and keep a note of it."
        echoing = _in_taste(line, echo, again)
        assert not users.satisfied(line, prompt, echoing), echoing  # type: ignore[attr-defined]
        advising = _in_taste(line, echo, helpful)
        assert users.satisfied(line, prompt, advising), advising  # type: ignore[attr-defined]
        edit = users.rewrite(prompt, f"{echo} {helpful}", topic)  # type: ignore[attr-defined]
        assert users.satisfied(line, prompt, edit), edit  # type: ignore[attr-defined]
        assert helpful in edit, edit
        assert echo not in edit, edit
    assert checked >= 5

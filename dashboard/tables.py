"""The feedback page's tables: browsers' logins and the review queue's claims.

They sit on the one database's base (:mod:`flywheel.database`); the one migration history
(``feedback/migrations``) creates them with every other package's tables. Only the page
writes them; a claim is about one stored request (a foreign key to
``interactions.request_id``), so erasing the request erases its claims too
(``feedback.schema.rows_about_requests``).
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import ForeignKey, Index, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from flywheel.database import BUSINESS_LINE_LENGTH, ID_LENGTH, Base, PrimaryKey, UTCDateTime


class DashboardSession(Base):
    """A browser's login to the feedback page (``dashboard.sessions``): the digest of its
    session id (never the id), the API key it logged in with (by digest) and its end."""

    __tablename__ = "dashboard_sessions"

    id_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_sha256: Mapped[str] = mapped_column(String(64))
    key_name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_dashboard_sessions_expires", "expires_at"),)


class ReviewClaim(Base):
    """An answer handed to a reviewer by the feedback page's review queue
    (``dashboard.review_queue``): kept from other reviewers until ``expires_at`` or the
    review, and never handed to the same reviewer (key name) again. The verdict itself
    is a ``review`` feedback event."""

    __tablename__ = "review_claims"

    id: Mapped[int] = mapped_column(PrimaryKey, primary_key=True, autoincrement=True)
    business_line: Mapped[str] = mapped_column(String(BUSINESS_LINE_LENGTH))
    request_id: Mapped[str] = mapped_column(
        String(ID_LENGTH), ForeignKey("interactions.request_id", ondelete="CASCADE")
    )
    reviewer: Mapped[str] = mapped_column(String(64))
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reviewed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    __table_args__ = (
        Index("ix_review_claims_reviewer", "business_line", "reviewer", "request_id", unique=True),
        Index("ix_review_claims_request", "business_line", "request_id"),
    )


dashboard_sessions_table = cast(Table, DashboardSession.__table__)
review_claims_table = cast(Table, ReviewClaim.__table__)

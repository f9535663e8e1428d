"""Check digits that tell a real identifier from a random run of digits."""

from __future__ import annotations

from datetime import date

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK_CHARS = "10X98765432"


def luhn_valid(number: str) -> bool:
    """True when the digits of ``number`` (separators ignored) pass the Luhn check."""
    digits = [int(ch) for ch in number if ch.isdigit()]
    if len(digits) < 2:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        doubled = digit * 2 if position % 2 == 1 else digit
        total += doubled - 9 if doubled > 9 else doubled
    return total % 10 == 0


def cn_resident_id_check_char(first17: str) -> str:
    """The check character (0-9 or X) of an 18-character Chinese resident ID (GB 11643)."""
    if len(first17) != 17 or not first17.isdigit():
        raise ValueError("expected the first 17 digits of a resident ID")
    total = sum(int(ch) * weight for ch, weight in zip(first17, _ID_WEIGHTS, strict=True))
    return _ID_CHECK_CHARS[total % 11]


def cn_resident_id_valid(value: str) -> bool:
    """True for an 18-character resident ID with a real birth date and a correct check char."""
    if len(value) != 18 or not value[:17].isdigit():
        return False
    try:
        date(int(value[6:10]), int(value[10:12]), int(value[12:14]))
    except ValueError:
        return False
    return cn_resident_id_check_char(value[:17]) == value[17].upper()


def iban_valid(value: str) -> bool:
    """True when ``value`` (spaces ignored, any case) passes the ISO 13616 mod-97 check."""
    compact = "".join(value.split()).upper()
    if not 15 <= len(compact) <= 34 or not compact.isalnum():
        return False
    if not (compact[:2].isalpha() and compact[2:4].isdigit()):
        return False
    rearranged = compact[4:] + compact[:4]
    numeric = "".join(str(int(ch, 36)) for ch in rearranged)
    return int(numeric) % 97 == 1

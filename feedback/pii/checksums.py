"""Check digits that tell a real identifier from a random run of digits.

Validation is python-stdnum's (Luhn, ISO 13616 IBANs with each country's
length and format, GB 11643 resident IDs with their birth date); only the
check character is computed here, for the simulator to make valid IDs.
"""

from __future__ import annotations

from stdnum import iban, luhn
from stdnum.cn import ric
from stdnum.exceptions import ValidationError

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK_CHARS = "10X98765432"


def luhn_valid(number: str) -> bool:
    """True when the digits of ``number`` (separators ignored) pass the Luhn check."""
    digits = "".join(ch for ch in number if ch.isdigit())
    return len(digits) >= 2 and bool(luhn.is_valid(digits))


def cn_resident_id_check_char(first17: str) -> str:
    """The check character (0-9 or X) of an 18-character Chinese resident ID (GB 11643)."""
    if len(first17) != 17 or not first17.isdigit():
        raise ValueError("expected the first 17 digits of a resident ID")
    total = sum(int(ch) * weight for ch, weight in zip(first17, _ID_WEIGHTS, strict=True))
    return _ID_CHECK_CHARS[total % 11]


def cn_resident_id_valid(value: str) -> bool:
    """True for an 18-character resident ID with a real birth date and a correct check char.

    The place of birth is not checked: stdnum's list of county codes lags behind
    renamed and merged counties, whose people keep their IDs.
    """
    if len(value) != 18 or not value[:17].isdigit():
        return False
    try:
        ric.get_birth_date(value)
    except ValidationError:
        return False
    return str(ric.calc_check_digit(value)) == value[17].upper()


def iban_valid(value: str) -> bool:
    """True for an IBAN (spaces ignored, any case) of a known country, with that country's
    length and format and a correct ISO 13616 mod-97 check."""
    return bool(iban.is_valid(value))

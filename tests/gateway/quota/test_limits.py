import pytest

from serving.errors import ServingError
from serving.gateway.quota import Limits, Scope
from serving.gateway.quota.limits import scoped_limits
from tests.gateway.quota.subjects import Subject


def test_limits_reject_negative_and_non_integer_values() -> None:
    with pytest.raises(ServingError, match="rpm must be a non-negative integer, got -1"):
        Limits(rpm=-1)
    with pytest.raises(ServingError, match="tpm must be a non-negative integer"):
        Limits(tpm=True)
    with pytest.raises(ServingError, match="max_tokens must be at least 1"):
        Limits(max_tokens=0)
    assert Limits(rpm=0).rpm == 0  # a key may be suspended with a zero limit


def test_limits_from_mapping_names_the_field() -> None:
    assert Limits.from_mapping({"rpm": 5, "tpm": None}) == Limits(rpm=5)
    with pytest.raises(ServingError, match=r"^keys\[0\]\.limits: unknown limit 'rps'"):
        Limits.from_mapping({"rps": 5}, where="keys[0].limits")
    with pytest.raises(ServingError, match=r"^x\.tpm must be an integer or null, got '5'"):
        Limits.from_mapping({"tpm": "5"}, where="x")
    with pytest.raises(ServingError, match=r"^x\.rpm must be a non-negative integer, got -2"):
        Limits.from_mapping({"rpm": -2}, where="x")


def test_to_mapping_omits_unset_limits() -> None:
    assert Limits(rpm=1, max_tokens=9).to_mapping() == {"rpm": 1, "max_tokens": 9}


def test_scoped_limits_adds_the_model_scope_only_when_overridden() -> None:
    key = Subject("key_a", Limits(rpm=10), {"m1": Limits(rpm=2)})
    assert scoped_limits(key, "m2") == ((Scope("key_a"), Limits(rpm=10)),)
    assert scoped_limits(key, "m1") == (
        (Scope("key_a"), Limits(rpm=10)),
        (Scope("key_a", "m1"), Limits(rpm=2)),
    )

import pytest

from flashdraft.mix.domains import MixError, parse_mix


def test_parse_mix_fills_missing_domains_with_zero():
    mix = parse_mix("coding=0.5,general=0.5")
    assert mix["coding"] == 0.5 and mix["math"] == 0.0 and abs(sum(mix.values()) - 1) < 1e-12


def test_parse_mix_accepts_percentages():
    assert parse_mix("coding=46,general=54")["coding"] == pytest.approx(0.46)


def test_unknown_domain_is_named_with_the_known_ones():
    with pytest.raises(MixError, match=r"unknown domain 'codng'.*coding"):
        parse_mix("codng=1.0")


def test_shares_not_summing_to_one_say_the_sum():
    with pytest.raises(MixError, match=r"sum to 0\.9.*add up to 1"):
        parse_mix("coding=0.5,general=0.4")


@pytest.mark.parametrize("spec,msg", [("", "empty"), ("coding", "domain=share"), ("coding=abc", "not a number"),
                                      ("coding=-0.1,general=1.1", ">= 0"), ("coding=0.5,coding=0.5", "twice")])
def test_bad_specs(spec, msg):
    with pytest.raises(MixError, match=msg):
        parse_mix(spec)


def test_custom_label_set():
    assert parse_mix("legal=0.2,other=0.8", labels=["legal", "other"]) == {"legal": 0.2, "other": 0.8}

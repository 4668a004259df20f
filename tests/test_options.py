"""KEY=VALUE options shared by pgc-hvd simulate and pgc-hvd train."""

import pytest

from pgc_hvd.options import parse_options


def test_repeated_and_comma_separated_pairs_mean_the_same():
    assert parse_options(["c=2", "r=2,decoder=min-error", "high=1.5"]) == \
        {"c": 2, "r": 2, "decoder": "min-error", "high": 1.5}
    assert parse_options(["c=2,r=2"]) == parse_options(["c=2", "r=2"])
    assert parse_options([]) == {} and parse_options(["", " , "]) == {}


@pytest.mark.parametrize("bad", ["c", "=2", "c=2,r"])
def test_a_pair_without_key_or_equals_names_itself(bad):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_options([bad], "--option")


def test_simulate_cli_reports_a_bad_option_as_usage_error(capsys, tmp_path):
    from pgc_hvd.apps.simulate import main
    with pytest.raises(SystemExit) as exc:
        main(["--scheme", "dgd", "--n", "4", "--s", "1", "--option", "c", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "KEY=VALUE" in capsys.readouterr().err

"""The report tables' number formats: what a reader sees in every committed report.md."""
import math

from kpca_attention.tables import fmt_num, fmt_p, fmt_pm


def test_fmt_num_significant_digits():
    assert fmt_num(0.012345) == "0.0123"
    assert fmt_num(3.14159) == "3.14"
    assert fmt_num(221.4) == "221"
    assert fmt_num(1e-7) == "1e-07"


def test_fmt_num_thousands_whole_not_scientific():
    # an MDE of 1,330 perplexity or 5,781 tokens/s read as "1.33e+03" / "5.78e+03" before
    assert fmt_num(1330.4) == "1,330"
    assert fmt_num(5781.2) == "5,781"
    assert fmt_num(-12345.6) == "-12,346"
    assert fmt_num(999.6) == "1,000"  # 3 significant digits round it up to the thousands
    assert fmt_num(999.4) == "999"
    assert fmt_num(2.2e9) == "2.2e+09"
    assert fmt_num(1500, digits=4) == "1500"


def test_fmt_num_missing_and_infinite():
    assert fmt_num(None) == "-"
    assert fmt_num(math.nan) == "-"
    assert fmt_num(math.inf) == "inf"


def test_fmt_pm_and_p():
    assert fmt_pm([0.5, 0.7]) == "60.0 ± 14.1"
    assert fmt_pm([None]) == "-"
    assert fmt_p(0.00001) == "<1e-4"
    assert fmt_p(0.0456) == "0.046"

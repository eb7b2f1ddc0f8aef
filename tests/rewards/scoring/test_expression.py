from fractions import Fraction

import pytest

from hybridflow.rewards.scoring.expression import ExpressionError, evaluate_expression


def test_values_and_literals():
    assert evaluate_expression("(3+5)*7") == (Fraction(56), [3, 5, 7])
    assert evaluate_expression("7/2 - -1") == (Fraction(9, 2), [7, 2, 1])
    assert evaluate_expression("6×2÷3")[0] == 4


@pytest.mark.parametrize(
    "text",
    ["2**100", "__import__('os').system('true')", "x+1", "(1).real", "[1]", "1.5+1", "True+1", "1/0", "", "1+" * 60],
)
def test_anything_but_integer_arithmetic_is_refused(text):
    with pytest.raises(ExpressionError):
        evaluate_expression(text)

"""scikit-learn's common estimator checks and the doctests of mdboost.boosting."""

import doctest
import importlib

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from mdboost.boosting import SelfNormalizedBoostClassifier


_TIE_REASON = (
    "a depth-1 tree breaks exact ties between equally good splits by float rounding of the "
    "impurity; weights 2/n vs two copies at 1/n round differently, so on the check's 15-sample, "
    "30-feature data a later round can pick another (tied) split. The boosting arithmetic itself "
    "is weight-equivalent (zero weight == dropping is tested in test_boosting.py); "
    "scikit-learn declares the same failure for AdaBoostClassifier."
)


# on the check's data (scikit-learn 1.9.1), sparse input: at round 7 the weighted fit and the fit on repeated rows
# pick two stumps that cut the weighted samples identically (the same impurity decrease to 1e-14)
# but put their thresholds elsewhere among the zero-weight samples, which the check then predicts
_ZERO_WEIGHT_TIE_REASON = (
    "on sparse input two stumps tie (the same partition of the samples of positive weight, the same "
    "impurity decrease to 1e-14) and differ only on where zero-weight samples fall, which the check "
    "predicts on; dropping those samples instead of weighting them 0 moves the threshold. Dense input "
    "passes."
)


def _expected_failed_checks(estimator):
    if estimator.hypothesis == "log_proba":  # the dense check passes on this data: no tie is hit
        return {"check_sample_weight_equivalence_on_sparse_data": _ZERO_WEIGHT_TIE_REASON}
    return {
        "check_sample_weight_equivalence_on_dense_data": _TIE_REASON,
        "check_sample_weight_equivalence_on_sparse_data": _TIE_REASON,
    }


@parametrize_with_checks(
    [
        SelfNormalizedBoostClassifier(n_estimators=10, random_state=0),
        SelfNormalizedBoostClassifier(n_estimators=10, hypothesis="log_proba", random_state=0),
    ],
    expected_failed_checks=_expected_failed_checks,
)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("module", ["labels", "margins", "scorers", "estimator"])
def test_doctests(module):
    mod = importlib.import_module(f"mdboost.boosting.{module}")
    result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0

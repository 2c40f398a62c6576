"""``tokenshards verify``: a finished run checked against format v1, partition by partition on the cluster."""
from .command import VerifyConfig, VerifyReport, run_verify

__all__ = ["VerifyConfig", "VerifyReport", "run_verify"]

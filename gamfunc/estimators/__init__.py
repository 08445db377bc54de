"""Gradient estimators: what direction to descend along. See [`Estimator`][gamfunc.estimators.Estimator]."""

from gamfunc.estimators.asam import asam
from gamfunc.estimators.base import Estimate, Estimator
from gamfunc.estimators.friendly_sam import FriendlySAMState, friendly_sam
from gamfunc.estimators.gam import gam
from gamfunc.estimators.gam_accelerated import gam_accelerated
from gamfunc.estimators.gnp import gnp
from gamfunc.estimators.gradient import gradient
from gamfunc.estimators.gsam import gsam
from gamfunc.estimators.look_gam import LookGAMState, look_gam
from gamfunc.estimators.looksam import LookSAMState, looksam
from gamfunc.estimators.msam import MSAMState, msam
from gamfunc.estimators.rwp import RWPState, rwp
from gamfunc.estimators.sam import sam
from gamfunc.estimators.wsam import wsam

__all__ = [
    "Estimate",
    "Estimator",
    "FriendlySAMState",
    "LookGAMState",
    "LookSAMState",
    "MSAMState",
    "RWPState",
    "asam",
    "friendly_sam",
    "gam",
    "gam_accelerated",
    "gnp",
    "gradient",
    "gsam",
    "look_gam",
    "looksam",
    "msam",
    "rwp",
    "sam",
    "wsam",
]

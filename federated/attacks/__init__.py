"""Attacks on federated learning: data poisoning and model (update) poisoning.

One registry, one module per attack (or family). The malicious set is chosen once per run
with :func:`choose_malicious`; data attacks (``kind`` ``"data"`` or ``"both"``) poison a
malicious client's images and labels once (:meth:`DataAttack.poison`); model attacks
(``kind`` ``"model"`` or ``"both"``) rewrite the malicious rows of the round's updates on the
server (:meth:`ModelAttack.step`, keeping the attack's state; :meth:`ModelAttack.apply` for a
stateless call). Optimised attacks (``requires_aggregate``) also take ``aggregate``, the
server's defence as a closure on a candidate ``(n, d)`` round.

>>> from federated.attacks import build_attack, choose_malicious, malicious_mask
>>> bad = choose_malicious(20, fraction=0.2, seed=0)
>>> attack = build_attack("sign_flip", scale=1.0)
>>> updates = attack.apply(updates, malicious_mask(client_ids, bad), generator)
"""

from federated.attacks import (  # noqa: F401  (registers the attacks)
    alie,
    backdoor,
    gaussian,
    inf,
    ipm,
    label_flip,
    mimic,
    min_max,
    nan,
    none,
    opt_alie,
    opt_ipm,
    scaling,
    sign_flip,
)
from federated.attacks.alie import ALittleIsEnough, alie_z
from federated.attacks.backdoor import Backdoor
from federated.attacks.base import (
    Aggregate,
    Attack,
    AttackRound,
    AttackState,
    DataAttack,
    ModelAttack,
    choose_malicious,
    client_seed,
    malicious_mask,
)
from federated.attacks.gaussian import GaussianNoise
from federated.attacks.inf import InfUpdate
from federated.attacks.ipm import InnerProductManipulation
from federated.attacks.label_flip import LabelFlip, flip_labels
from federated.attacks.line_search import LineSearchAttack, line_maximize
from federated.attacks.mimic import Mimic, learn_direction
from federated.attacks.min_max import MinMax, MinSum, halving_search, perturbation_direction
from federated.attacks.nan import NaNUpdate
from federated.attacks.none import NoAttack
from federated.attacks.opt_alie import OptimalALIE
from federated.attacks.opt_ipm import OptimalIPM
from federated.attacks.registry import ATTACKS, build_attack, list_attacks, register_attack
from federated.attacks.scaling import Scaling
from federated.attacks.sign_flip import SignFlip

__all__ = [
    "ATTACKS",
    "ALittleIsEnough",
    "Aggregate",
    "Attack",
    "AttackRound",
    "AttackState",
    "Backdoor",
    "DataAttack",
    "GaussianNoise",
    "InfUpdate",
    "InnerProductManipulation",
    "LabelFlip",
    "LineSearchAttack",
    "Mimic",
    "MinMax",
    "MinSum",
    "ModelAttack",
    "NaNUpdate",
    "NoAttack",
    "OptimalALIE",
    "OptimalIPM",
    "Scaling",
    "SignFlip",
    "alie_z",
    "build_attack",
    "choose_malicious",
    "client_seed",
    "flip_labels",
    "halving_search",
    "learn_direction",
    "line_maximize",
    "list_attacks",
    "malicious_mask",
    "perturbation_direction",
    "register_attack",
]

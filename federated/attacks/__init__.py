"""Attacks on federated learning: data poisoning and model (update) poisoning.

One registry, one module per attack. The malicious set is chosen once per run with
:func:`choose_malicious`; data attacks (``kind == "data"``) poison a malicious client's
labels once (:meth:`DataAttack.poison_labels`); model attacks (``kind == "model"``)
rewrite the malicious rows of the round's updates on the server (:meth:`ModelAttack.apply`).

>>> from federated.attacks import build_attack, choose_malicious, malicious_mask
>>> bad = choose_malicious(20, fraction=0.2, seed=0)
>>> attack = build_attack("sign_flip", scale=1.0)
>>> updates = attack.apply(updates, malicious_mask(client_ids, bad), generator)
"""

from federated.attacks import (  # noqa: F401  (registers the attacks)
    alie,
    gaussian,
    ipm,
    label_flip,
    nan,
    none,
    scaling,
    sign_flip,
)
from federated.attacks.alie import ALittleIsEnough, alie_z
from federated.attacks.base import (
    Attack,
    DataAttack,
    ModelAttack,
    choose_malicious,
    client_seed,
    malicious_mask,
)
from federated.attacks.gaussian import GaussianNoise
from federated.attacks.ipm import InnerProductManipulation
from federated.attacks.label_flip import LabelFlip, flip_labels
from federated.attacks.nan import NaNUpdate
from federated.attacks.none import NoAttack
from federated.attacks.registry import ATTACKS, build_attack, list_attacks, register_attack
from federated.attacks.scaling import Scaling
from federated.attacks.sign_flip import SignFlip

__all__ = [
    "ATTACKS",
    "ALittleIsEnough",
    "Attack",
    "DataAttack",
    "GaussianNoise",
    "InnerProductManipulation",
    "LabelFlip",
    "ModelAttack",
    "NaNUpdate",
    "NoAttack",
    "Scaling",
    "SignFlip",
    "alie_z",
    "build_attack",
    "choose_malicious",
    "client_seed",
    "flip_labels",
    "list_attacks",
    "malicious_mask",
    "register_attack",
]

"""FedStNN: federated stochastic neural networks (Tang, Bausback, Bao & Archibald 2025,
https://arxiv.org/abs/2506.08169).

Submodules: ``losses`` (proper scoring rules over K sampled outputs), ``smp`` (the
sample-wise stochastic-maximum-principle gradient), ``train`` (local training and the
federation with drift and diffusion aggregated separately), ``experiments`` (the paper's
1-D, 2-D and image experiments: data generators and one runner). The model is
:class:`models.snn.SNN`.
"""

__all__: list[str] = []

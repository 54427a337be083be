"""`config.model.output_layer` / `config.model.output`: the LM output-layer settings (no JAX import, so config
files can use `config_defaults()` cheaply). The layers themselves are in `xlgen.models.output_layers`."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

OUTPUT_LAYER_NAMES = ("softmax", "adaptive", "mos", "moc", "sigsoftmax", "gss", "plif", "mixtape")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """Settings of the output layer and its regularisers (`config.model.output.*`). Unused keys are ignored.

    n_experts       K of mos / moc / mixtape (mixtape: a power of two, sigmoid-tree priors)
    expert_dropout  dropout on the MoS/MoC/Mixtape context vectors h_{c,k} ("MoS dropout", 0.29 in 001)
    d2              mixtape gate width (v_z ∈ R^{d2}, d2 ≪ d)
    c, k            gss P̃L(x; c, k): softmax = (c, 1), sigsoftmax = (0, 2); 001 picks (-1.5, 2.5) on PTB
    plif_intervals  LMS-PLIF pieces K (001: 1e5) on [-plif_range, plif_range] (001: 20)
    adv_eps         AdvSoft ε (0 = off): margin ε‖h‖ on the target logit during training
    cosreg          CosReg γ (0 = off)
    spectrum_control  E = U diag(σ) Vᵀ (tied); sc_* are its penalties (0 = off) and prior ("none" | "exp" | "poly")
    """

    n_experts: int = 4
    expert_dropout: float = 0.0
    d2: int = 16
    c: float = 0.0
    k: float = 2.0
    plif_intervals: int = 1000
    plif_range: float = 20.0
    adv_eps: float = 0.0
    cosreg: float = 0.0
    spectrum_control: bool = False
    sc_lambda_u_fro: float = 0.0
    sc_lambda_v_fro: float = 0.0
    sc_lambda_u_spec: float = 0.0
    sc_lambda_v_spec: float = 0.0
    sc_prior: str = "none"
    sc_lambda_prior: float = 0.0
    sc_c1: float = 1.0
    sc_c2: float = 1.0
    sc_gamma: float = 1.0

    def __post_init__(self):
        if self.n_experts < 1:
            raise ValueError(f"config.model.output.n_experts={self.n_experts}: must be >= 1")
        if not 0.0 <= self.expert_dropout < 1.0:
            raise ValueError(f"config.model.output.expert_dropout={self.expert_dropout}: must be in [0, 1)")
        if self.plif_intervals < 1 or self.plif_range <= 0:
            raise ValueError("config.model.output.plif_intervals must be >= 1 and plif_range > 0")
        if self.sc_prior not in ("none", "exp", "poly"):
            raise ValueError(f"config.model.output.sc_prior={self.sc_prior!r}: expected 'none', 'exp' or 'poly'")
        if self.adv_eps < 0 or self.cosreg < 0:
            raise ValueError("config.model.output.adv_eps and cosreg must be >= 0")

    @classmethod
    def from_any(cls, value) -> "OutputConfig":
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        d = dict(value)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"config.model.output.{unknown[0]}: unknown key; valid keys: {sorted(names)}")
        return cls(**d)


def config_defaults(output_layer: str = "adaptive") -> Dict[str, Any]:
    """`output_layer` and `output` entries for a Transformer-XL config file (`c.model = dict(..., **this)`), and
    the adaptive softmax's work sizes: `softmax_block_size` (vocabulary rows per log-normaliser block) and
    `softmax_chunk_size` (tokens per tail-cluster chunk)."""
    return {
        "output_layer": output_layer,
        "output": dataclasses.asdict(OutputConfig()),
        "softmax_block_size": 32768,
        "softmax_chunk_size": 256,
    }

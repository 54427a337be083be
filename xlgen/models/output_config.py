"""`config.model.output_layer` / `config.model.output`: the LM output-layer settings (no JAX import, so config
files can use `config_defaults()` cheaply). The layers themselves are in `xlgen.models.output_layers`."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

OUTPUT_LAYER_NAMES = ("softmax", "adaptive", "mos", "moc", "doc", "sigsoftmax", "gss", "plif", "mixtape")
EXPERT_DROPOUTS = ("variational", "element")
EXPERT_SPACES = ("embed", "model")
PLIF_INITS = ("random", "identity")
SC_PRIOR_ORDERS = ("sorted", "index")


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    """Settings of the output layer and its regularisers (`config.model.output.*`). Unused keys are ignored.

    n_experts       K of mos / moc / mixtape (mixtape: a power of two, sigmoid-tree priors)
    expert_dropout  dropout on the MoS/MoC/DOC/Mixtape context vectors h_{c,k} ("MoS dropout", 0.29 in 001)
    expert_dropout_kind  "variational" (default; 000 A.7 "context vector V-dropout": one mask per sequence and
                    feature, shared over time) | "element" (a fresh mask per position)
    expert_space    "embed" (default; 001 §3.1.2: h_{c,k} = tanh(W_k h) ∈ R^{d_e}, the tanh in the embedding space)
                    | "model" (tanh(W_k h) ∈ R^{d_model}, then the tied projection: P·tanh(W_k h)). The same
                    when d_e = d_model and there is no projection.
    prior_bias      MoS/MoC/DOC prior π = softmax(W_π g + b): False (default; 000 A.2.4 has no bias) | True
    doc_counts      DOC's v_i, from the top layer down: (15, 5) = 15 components from the last layer's output and 5
                    from the layer below (001 §3.1.6: R = 20, v3 = 15, v2 = 5); the last entry may reach the
                    embedding output o_0 (n_layer + 1 entries at most)
    doc_tanh        DOC's g_{c,r} = tanh(W_{r,i} o_i) (True, default: Takase et al.; then DOC with counts (K,) is
                    exactly MoS) | W_{r,i} o_i (False, 001 eq. 3.15 as printed)
    d2              mixtape gate width (v_z ∈ R^{d2}, d2 ≪ d)
    c, k            gss P̃L(x; c, k): softmax = (c, 1), sigsoftmax = (0, 2); 001 picks (-1.5, 2.5) on PTB
    plif_intervals  LMS-PLIF pieces K (default 1e5 as 001 §4.3.2.1) on [-plif_range, plif_range] (001: 20)
    plif_init       "random" (default; 001 §5.7.1: random positive slopes, softplus(v) with v ~ N(0, 1)) |
                    "identity" (all slopes 1: f(x) = x at init)
    adv_eps         AdvSoft ε (0 = off): margin ε‖h‖ on the target logit during training
    cosreg          CosReg γ (0 = off)
    spectrum_control  E = U diag(σ) Vᵀ (tied); sc_* are its penalties (0 = off) and prior ("none" | "exp" | "poly")
    sc_prior_order  "sorted" (default): the prior compares the singular values |σ| in descending order with the
                    descending target (seed 002: σ_k is the k-th largest) | "index" (σ_k by parameter position,
                    signs kept)
    """

    n_experts: int = 4
    expert_dropout: float = 0.0
    expert_dropout_kind: str = "variational"
    expert_space: str = "embed"
    prior_bias: bool = False
    doc_counts: Tuple[int, ...] = (15, 5)
    doc_tanh: bool = True
    d2: int = 16
    c: float = 0.0
    k: float = 2.0
    plif_intervals: int = 100000
    plif_range: float = 20.0
    plif_init: str = "random"
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
    sc_prior_order: str = "sorted"

    def __post_init__(self):
        object.__setattr__(self, "doc_counts", tuple(int(v) for v in self.doc_counts))
        for key, allowed in (
            ("expert_dropout_kind", EXPERT_DROPOUTS),
            ("expert_space", EXPERT_SPACES),
            ("plif_init", PLIF_INITS),
            ("sc_prior_order", SC_PRIOR_ORDERS),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(f"config.model.output.{key}={getattr(self, key)!r}: expected one of {allowed}")
        if not self.doc_counts or min(self.doc_counts) < 0 or sum(self.doc_counts) < 1:
            raise ValueError(f"config.model.output.doc_counts={self.doc_counts}: non-negative counts, sum >= 1")
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
    the adaptive softmax's work sizes and storage: `softmax_block_size` (vocabulary rows per log-normaliser block),
    `softmax_chunk_size` (tokens per tail-cluster chunk) and `table_rows_multiple` (each cluster table's stored rows
    rounded up to this, so that they split over the fsdp devices; 1 = the exact sizes)."""
    return {
        "output_layer": output_layer,
        "output": dataclasses.asdict(OutputConfig()),
        "softmax_block_size": 32768,
        "softmax_chunk_size": 256,
        "table_rows_multiple": 1,
    }

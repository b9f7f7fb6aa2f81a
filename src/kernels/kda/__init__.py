"""KDA (Kimi Delta Attention) chain-verify kernels for speculative decoding.

causal_conv1d_update                    conv update (decode: rolls the state; verify: windows)
fused_sigmoid_gating_delta_rule_update  gate + beta + gated delta rule (snapshots or ring)
fused_kda_conv_gating_verify            all of it in one kernel (module fused_verify)
(module tuning)                         tiles and step forms by mode and batch (`tuning=`)
reference                               plain PyTorch: verify(...), replay(...), per-step math
validate_indices                        range and duplicate check of an index vector (syncs)
"""

from . import fused_verify, reference
from .checks import validate_indices
from .conv import causal_conv1d_update
from .fused_verify import fused_kda_conv_gating_verify
from .recurrent import fused_sigmoid_gating_delta_rule_update

__all__ = [
    "causal_conv1d_update",
    "fused_kda_conv_gating_verify",
    "fused_sigmoid_gating_delta_rule_update",
    "fused_verify",
    "reference",
    "validate_indices",
]

"""The EAGLE-3 drafter family: config (``config.json``), the decoder layer, the drafter with its chain
and dynamic-tree inference (model, tree) and the unrolled training-time-test forward (ttt).
Importing the package registers the family under vLLM's architecture name ``LlamaForCausalLMEagle3``."""

from flashdraft.models.eagle3.config import Eagle3Config, Eagle3Inner
from flashdraft.models.eagle3.model import Eagle3Drafter, eagle_layer_ids

__all__ = ["Eagle3Config", "Eagle3Drafter", "Eagle3Inner", "eagle_layer_ids"]

"""Target-layer id conventions of the formats flashdraft writes and reads, translated explicitly.

flashdraft (and z-lab) id ``i``: the 0-based decoder layer whose *output* feeds the drafter,
i.e. HF ``output_hidden_states`` -> ``hidden_states[i + 1]`` (index 0 is the embedding output).

- z-lab ``dflash_config.target_layer_ids``: the same ids (``extract_context_feature`` reads
  ``hidden_states[i + 1]``).
- vLLM aux ids (``eagle_aux_hidden_state_layer_ids``): id ``j`` is the residual stream *entering*
  layer ``j`` = ``hidden_states[j]``, so ``j = i + 1``. vLLM adds that 1 itself when it reads
  ``dflash_config.target_layer_ids``; flashdraft writes both fields, consistent with each other.
- speculators ``aux_hidden_state_layer_ids``: the vLLM aux convention (``i + 1``).
- SGLang reads the z-lab field and captures the input of layer ``i + 1``: the file holds z-lab ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashdraft.errors import FlashdraftError


class ConventionError(FlashdraftError, ValueError):
    """Layer ids in a file that do not translate into flashdraft ids; the message names the field."""


@dataclass(frozen=True)
class LayerConvention:
    name: str
    field: str  # where the ids live in that format's config.json
    offset: int  # id in the file = flashdraft id + offset
    meaning: str

    def to_file(self, ids: list[int]) -> list[int]:
        return [int(i) + self.offset for i in ids]

    def from_file(self, ids: list[int]) -> list[int]:
        out = [int(i) - self.offset for i in ids]
        if any(i < 0 for i in out):
            raise ConventionError(
                f"{self.field} {list(ids)} ({self.name}: {self.meaning}) give a negative decoder-layer id; "
                "the checkpoint's ids follow another convention: fix the field or import with the matching --from"
            )
        return out


CONVENTIONS: dict[str, LayerConvention] = {
    c.name: c
    for c in (
        LayerConvention("flashdraft", "dflash_config.target_layer_ids", 0,
                        "decoder layer i's output = HF hidden_states[i + 1]"),
        LayerConvention("zlab", "dflash_config.target_layer_ids", 0,
                        "decoder layer i's output = HF hidden_states[i + 1]"),
        LayerConvention("vllm", "eagle_aux_hidden_state_layer_ids", 1,
                        "residual stream entering layer j = HF hidden_states[j]"),
        LayerConvention("speculators", "aux_hidden_state_layer_ids", 1,
                        "residual stream entering layer j = HF hidden_states[j]"),
        LayerConvention("sglang", "dflash_config.target_layer_ids", 0,
                        "z-lab ids; SGLang captures the input of layer i + 1, the same tensor"),
    )
}


def hf_hidden_state_index(convention: str, file_id: int) -> int:
    """The index into HF ``output_hidden_states`` that a file id of ``convention`` denotes."""
    c = CONVENTIONS[convention]
    return c.from_file([file_id])[0] + 1

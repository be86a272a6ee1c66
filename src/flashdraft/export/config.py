"""Config sections of ``flashdraft export``, ``import`` and ``serve-cmd`` (YAML ``--config``, ``--set``, flags)."""

from __future__ import annotations

from pydantic import Field

from flashdraft.config import Section


class ExportConfig(Section):
    """What ``flashdraft export`` writes: which drafter, in which format, where, for which target."""

    drafter: str = Field(description="flashdraft drafter folder (config.json + model.safetensors)")
    to: str = Field(description="format: zlab, vllm, speculators or sglang")
    out: str = Field(description="folder to write (replaced atomically; files of other names in it are kept)")
    overwrite: bool = Field(False, description="write into an existing folder that holds files export did not write")
    target: str = Field("gemma-3-270m", description="target spec (embedded name, .gguf, HF folder or id)")
    target_ref: str | None = Field(None, description="target name written into the files and commands "
                                   "(default: the target as given; never a folder of flashdraft's cache)")
    modeling_file: str | None = Field(None, description="z-lab's dflash.py to place next to the weights")
    dtype: str | None = Field(None, description="dtype the server runs (default: the drafter's)")


class ImportConfig(Section):
    """What ``flashdraft import`` converts: a published checkpoint into a flashdraft drafter folder."""

    source: str = Field(description="checkpoint folder: DFlash (z-lab, vLLM-style, SGLang, speculators) or "
                        "EAGLE-3 (vLLM-style, speculators)")
    out: str = Field(description="flashdraft drafter folder to write (files of other names in it are kept)")
    overwrite: bool = Field(False, description="write into an existing folder that is not a drafter folder")
    from_: str = Field("auto", alias="from", description="auto, or a format of the checkpoint's family: zlab, vllm, "
                       "sglang, speculators (DFlash); vllm, speculators (EAGLE-3)")
    target: str | None = Field(None, description="target to check the fit against")
    mask_token_id: int | None = Field(None, description="mask token id for checkpoints without one")

    model_config = {**Section.model_config, "populate_by_name": True}


class ServeCmdConfig(Section):
    """What ``flashdraft serve-cmd`` prints the server commands for."""

    drafter: str = Field(description="exported drafter folder")
    target: str = Field(description="target as the server should load it (HF folder or id)")
    family: str | None = Field(None, description="target model_type when the folder has no export manifest")
    port: int = Field(8000, ge=1, le=65535)

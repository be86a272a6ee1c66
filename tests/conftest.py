import pytest
import torch

# One intra-op thread: tiny models gain nothing from more, and on a loaded 2-core machine OpenMP
# threads that wait on each other make a 270M forward 20x slower (measured: 76 ms vs 1.7 s).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def embedded_target():
    """The real embedded Gemma-3-270M (fp32), loaded once per test session."""
    from flashdraft.models.target import load_target

    return load_target("gemma-3-270m", dtype="float32")


@pytest.fixture(scope="session")
def smollm2_target():
    """The real embedded SmolLM2-135M-Instruct (fp32; a chat model with a ChatML template), loaded once."""
    from flashdraft.models.target import load_target

    return load_target("smollm2-135m-instruct", dtype="float32")

"""Decoding: AR, DFlash (chain), DDTree (tree), EAGLE-3 (chain, dynamic tree) and prompt lookup behind one
interface (see base.Decoder).

The decoder modules register their methods here, on import of the package: :mod:`base` holds the
interface and the registry, :mod:`speculative`, :mod:`eagle3` and :mod:`ngram` fill it; nothing imports back up.
"""

from flashdraft.decode import eagle3, ngram, speculative  # noqa: F401  (register the decoding methods)
from flashdraft.decode.base import DECODERS, DecodeError, Decoder, DecodeStats, Generation, build_decoder

__all__ = ["DECODERS", "DecodeError", "Decoder", "DecodeStats", "Generation", "build_decoder"]

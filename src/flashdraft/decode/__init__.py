"""Decoding: AR, DFlash (chain) and DDTree (tree) behind one interface (see base.Decoder)."""

from flashdraft.decode.base import DECODERS, DecodeError, Decoder, DecodeStats, Generation, build_decoder

__all__ = ["DECODERS", "DecodeError", "Decoder", "DecodeStats", "Generation", "build_decoder"]

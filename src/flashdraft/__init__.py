"""flashdraft: lossless speculative decoding, from data generation to drafter export."""

__version__ = "0.1.0"

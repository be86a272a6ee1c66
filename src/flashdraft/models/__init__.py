"""Models shared by every stage: target loading and drafters."""

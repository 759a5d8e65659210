"""Speculative decoding: drafters, the draft model and the adaptive draft length."""

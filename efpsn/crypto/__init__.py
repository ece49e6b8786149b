"""Cryptography for phase I: fixed-point integer encoding and Paillier; nothing else touches big
integers."""

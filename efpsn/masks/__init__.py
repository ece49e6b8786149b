"""The zero-sum masks: phase I over Paillier, edge seeds and key streams, refreshed and fading
masks, message masks."""

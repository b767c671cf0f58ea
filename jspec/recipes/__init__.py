"""Recipes that rebuild the shipped checkpoints end to end (data, training, measurement):
`code_pair` the shipped code models and their heads, `smollm2` the SmolLM2 drafters
(`smollm2_eagle3`, `smollm2_draft`), `answers` the growing store of SmolLM2's own answers
they train on. The top layer: it may import every other."""

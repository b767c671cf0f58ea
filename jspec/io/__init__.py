"""Models in and out: jspec's native checkpoints, Hugging Face directories, GGUF files,
tokenizers (tokenizer.json and GGUF vocabularies, chat templates), text generation,
drafters published in other projects' layouts (drafter_layouts), and the Flax Linen / NNX
adapters.
"""

"""Training on top of the engine: the corpus, the shared trainer (optax, orbax), the
decoder's objectives (cross-entropy, distillation) and the drafters' (Medusa heads,
EAGLE heads with the training-time test). Above `jspec.io`; the recipes of the shipped
checkpoints (`jspec.recipes`) build on it."""

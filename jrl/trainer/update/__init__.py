"""How a role is trained: the learner (parameters, optimizer state, the compiled update), its
optimizer, and the batching around it (mini/micro-batches, dynamic batch sizes, packing,
balance)."""

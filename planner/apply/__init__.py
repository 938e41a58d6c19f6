"""Stage 4, apply: rewrite a model per rank into layers3d layers and redistributions as a plan says (rewrite, graph, layers, blocks, values), and gather the dense state dict back (state)."""

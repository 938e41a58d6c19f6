"""Stage 1, capture: a model and example inputs become a ModelGraph of OpNodes with exact shapes (torch.fx, torch.export fallback). The entry point is `planner.capture` (planner/trace/tracer.py)."""

"""What the library's modules share: atomic file writes (:mod:`.fileio`), process memory
(:mod:`.memory`), a model's image backbone (:mod:`.model_parts`), the banded argmax
(:mod:`.labels`) and quiet loggers (:mod:`.quiet`)."""

"""Dataset utilities for mmcirc (toy data generation lives in ``toy_data``)."""

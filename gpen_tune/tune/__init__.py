"""The six optimizations, one module each, composed by `TuneConfig`."""

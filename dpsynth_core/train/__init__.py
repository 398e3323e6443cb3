"""`dpsynth train` as a method on the run loop: one DP-SGD LoRA stage (``train.method``)."""

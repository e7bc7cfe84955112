"""The runners: the training loop around the compiled host loops; eval, predict, export."""

class Experiment: pass

"""InitialGAN (seed 004): a language GAN over word representations, every parameter randomly initialised.

lstm.py     fully normalised / LayerNorm LSTM cells (eq. 3), stacked over time
aligner.py  Transformer aligner: words -> N(μ, σ²), F_LT back to words, the loss of eq. 4
gan.py      generator with dropout sampling (§III-B), discriminator, WGAN + Lipschitz penalty (eqs. 5-6)
data.py     sentence files -> word vocabulary, length filter, batches as a function of (seed, step)
system.py   the three players' parameters, optimizers and train steps (Algorithm 1), sampling
"""

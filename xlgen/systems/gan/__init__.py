"""Generative adversarial systems of the seeds: CEGAN (calibrated energy-based GANs, seed 000 Appendix B) and bad-GAN
semi-supervised learning (seed 003 §3.1, seed 000 Appendix C). See docs/gan.md."""

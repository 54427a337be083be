"""InitialGAN (seed 004): a language GAN over word representations, every parameter randomly initialised.

    xlgen train --config=configs/textgan/initialgan.py --config.data.train=FILE --workdir=W
    xlgen generate --workdir=W --num_samples=N [--seed=S]         N sentences, one per line
    xlgen eval --workdir=W        # W/eval_results.json: BLEU, Self-BLEU, Inverse BLEU, FED, LCR; W/eval/samples.txt

FILE holds one tokenized sentence per line. Widths, heads, layers, rates, λ's and optimizers are the paper's
Appendix C; steps are small so that a CPU run finishes (the paper: 200 aligner epochs, 2,000-3,000 adversarial
epochs at batch 128). `initialgan.py:tiny` is a CPU-sized variant (tests, reproductions). Ablations (Fig. 7):
`--config.model.dropout_sampling=False`, `--config.model.cell=ln` (LayerNorm LSTM) or `plain`.
"""

import ml_collections


def get_config(arg: str = ""):
    from xlgen.config import base_config, model_section

    c = base_config()
    # widths, cell and sampling rate: InitialGANConfig's defaults (Appendix C); the three networks' sizes here
    c.model = model_section(
        "initialgan",
        aligner=dict(d_model=512, n_layer=4, n_head=8, d_inner=2048, dropout=0.5),
        generator=dict(hidden=512, num_layers=2),
        discriminator=dict(hidden=1024, num_layers=2),
    )
    c.objective = "initialgan"
    c.data = ml_collections.ConfigDict(
        dict(
            train="",  # one tokenized sentence per line
            valid="",  # reference sentences; empty: hold out valid_fraction of train by split_seed
            valid_fraction=0.1,
            split_seed=0,
            length="short",  # short (max_len 20, COCO-like) | long (51, EMNLP-News-like)
            max_len=0,  # words + </s>; 0: by `length`
            max_vocab=0,  # 0: every training word
            batch_size=128,  # bs_d; the generator's batch is bs_d / (1 - ρ)
            seed=0,  # batch order
        )
    )
    player = lambda lr, b1, b2, wd: dict(learning_rate=lr, b1=b1, b2=b2, weight_decay=wd, clip_norm=0.0)  # noqa: E731
    c.players = ml_collections.ConfigDict(
        dict(
            aligner=player(1e-4, 0.9, 0.999, 1e-5),  # AdamW
            discriminator=player(4e-4, 0.5, 0.9, 1e-4),  # AdamW (COCO; 2e-4 for EMNLP News)
            generator=player(1e-4, 0.5, 0.9, 0.0),  # Adam
        )
    )
    c.lambda_a = 0.1  # variance penalty of eq. 4
    c.lambda_d = 50.0  # Lipschitz penalty of eq. 5
    c.aligner_steps = 2000
    c.total_steps = 12000
    c.checkpoint.update(dict(keep=2, async_save=False, save_mems=False))
    c.mesh.rules = "dp"
    c.eval_every_steps = 1000
    c.eval = ml_collections.ConfigDict(
        dict(split="valid", num_samples=1000, num_bleu=300, tau=0.65, encoder_dim=256, seed=0)
    )
    c.tensorboard = False
    # the players' losses are adversarial, not minimised: no divergence rule (non-finite steps are still guarded)
    c.divergence_factor = 0.0
    if arg == "tiny":
        c.model.update(d_embed=32, d_noise=16, d_rep=32)
        c.model.aligner.update(d_model=32, n_layer=1, n_head=2, d_inner=64, dropout=0.1)
        c.model.generator.update(hidden=32, num_layers=2)
        c.model.discriminator.update(hidden=48, num_layers=2)
        c.data.batch_size = 16
        c.aligner_steps, c.total_steps = 4, 8
        c.log_every_steps, c.checkpoint.every_steps, c.eval_every_steps = 2, 4, 0
        c.eval.update(num_samples=64, num_bleu=32, encoder_dim=16)
    elif arg == "small":  # the reproduction's CPU size (docs/reproductions.md)
        c.model.update(d_embed=64, d_noise=16, d_rep=64)
        c.model.aligner.update(d_model=64, n_layer=2, n_head=4, d_inner=128, dropout=0.1)
        c.model.generator.update(hidden=128, num_layers=2)
        c.model.discriminator.update(hidden=128, num_layers=2)
        c.data.batch_size = 32
        c.players.aligner.learning_rate = 1e-3  # 600 steps instead of 200 epochs
        c.aligner_steps, c.total_steps = 600, 900  # then 300 adversarial steps (a few CPU minutes per run)
        c.log_every_steps, c.checkpoint.every_steps, c.eval_every_steps = 50, 300, -1
        c.eval.update(num_samples=500, num_bleu=200, encoder_dim=128)
    elif arg:
        raise ValueError(f"unknown variant {arg!r}; expected 'tiny', 'small' or nothing")
    return c

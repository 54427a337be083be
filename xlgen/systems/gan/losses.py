"""The adversarial objectives as functions of network outputs (each reads as its equation; shapes in brackets).

CEGAN (seed 000 Appendix B): the discriminator is a cost c(x) (energy); with K(p_gen) = -H(p_gen) (eq. B.1)

    max_c min_{p_gen}  E_{p_gen}[c(x)] - E_{p_data}[c(x)] - H(p_gen)

    egan_d_loss    the discriminator's side, E_data[c] - E_gen[c], with the paper's code's margin
                   mean_i max(E_data[c] - c(x̃_i), -m) (bounds how far fake costs are pushed up)
    egan_g_loss    E_gen[c] (EGAN-Const: K = const)
    knn_entropy_surrogate   EGAN-Ent-NN: a scalar whose gradient w.r.t. generated x_i is
                   α (µ_i - x_i) / ‖µ_i - x_i‖ / N, µ_i the mean of x_i's k nearest neighbours in the batch
                   (eqs. B.10-B.11), so that descending it follows -∇H
    vi_entropy_bound        EGAN-Ent-VI: U(q) = E_{z, x=G(z)}[-log q(z|x)] (eqs. B.15-B.16), q = N(µ, diag σ²)
                   (eq. B.26); -H(p_gen) <= U(q) + const
    gan_d_loss / gan_g_loss the standard GAN (binary cross-entropy; the generator's non-saturating form)

Bad GAN (seed 003 §3.1.5, seed 000 Appendix C): class logits l [B, K], the fake class's logit fixed at 0, so
P(K+1|x) = 1 / (1 + Σ_k exp l_k) and log P(y <= K | x) = lse(l) - softplus(lse(l)).

    kplus1_d_loss  -(eq. C.5): -E_L log P(y|x, y<=K) - E_U log P(y<=K|x) - E_G log P(K+1|x)
                   - w_ent E_U Σ_{k<=K} P(k|x) log P(k|x)
    feature_matching        ‖E_G f(x) - E_U f(x)‖² / d (the paper's code averages over the d features)
    pull_away      L_PT = 1/(N(N-1)) Σ_i Σ_{j≠i} (f_i·f_j / (‖f_i‖‖f_j‖))²
    low_density    E_G[log p(x) I[log p(x) > log ε]] (eq. C.3), averaged over the samples above the threshold
                   (the paper's code's normalisation); gradient flows into x only through log p(x)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# --- CEGAN --------------------------------------------------------------------------------------------------------


def egan_d_loss(c_real, c_fake, margin: float = 0.0):
    """c_real [B], c_fake [B] -> the discriminator's loss (minimised): E_data[c] - E_gen[c] (margin m > 0: the
    mean over fake rows of max(E_data[c] - c(x̃_i), -m))."""
    if margin > 0:
        return jnp.mean(jnp.maximum(jnp.mean(c_real) - c_fake, -margin))
    return jnp.mean(c_real) - jnp.mean(c_fake)


def egan_g_loss(c_fake):
    """c_fake [B] -> E_gen[c] (the generator's adversarial term)."""
    return jnp.mean(c_fake)


def knn_mean(x, k: int):
    """x [N, d] -> µ [N, d]: the mean of each row's k nearest other rows (Euclidean; eq. B.10)."""
    d2 = jnp.sum((x[:, None, :] - x[None, :, :]) ** 2, -1)
    d2 = d2 + jnp.diag(jnp.full((x.shape[0],), jnp.inf, d2.dtype))
    _, idx = jax.lax.top_k(-d2, k)
    return jnp.mean(x[idx], axis=1)


def knn_entropy_gradient(x, k: int, alpha: float):
    """x [N, d] -> g [N, d] = α (µ_i - x_i) / ‖µ_i - x_i‖: the per-sample estimate of ∂(-H)/∂x_i (eq. B.11)."""
    x = jax.lax.stop_gradient(x)
    v = knn_mean(x, k) - x
    return alpha * v / (jnp.linalg.norm(v, axis=-1, keepdims=True) + 1e-8)


def knn_entropy_surrogate(x, k: int, alpha: float):
    """x [N, d] -> scalar s with ∂s/∂x_i = knn_entropy_gradient(x)_i / N (a stop-gradient surrogate for -H)."""
    g = knn_entropy_gradient(x, k, alpha)
    return jnp.sum(g * x) / x.shape[0]


def gaussian_log_prob(z, mu, log_sigma):
    """log N(z; µ, diag σ²) summed over the last axis: [B, d] -> [B]."""
    return jnp.sum(-0.5 * ((z - mu) * jnp.exp(-log_sigma)) ** 2 - log_sigma - 0.5 * jnp.log(2 * jnp.pi), -1)


def vi_entropy_bound(z, mu, log_sigma):
    """U(q) = E[-log q(z|x)] over the batch (eq. B.16): z [B, d_z] the generator's noise, (µ, log σ) = f_infer(G(z))."""
    return -jnp.mean(gaussian_log_prob(z, mu, log_sigma))


def gan_d_loss(l_real, l_fake):
    """Logits [B] of D(x) = sigmoid(l): -E_data log D - E_gen log(1 - D)."""
    return jnp.mean(jax.nn.softplus(-l_real)) + jnp.mean(jax.nn.softplus(l_fake))


def gan_g_loss(l_fake):
    """The non-saturating generator loss -E_gen log D(G(z))."""
    return jnp.mean(jax.nn.softplus(-l_fake))


# --- Bad GAN ------------------------------------------------------------------------------------------------------


def kplus1_terms(logits_lab, labels, logits_unl, logits_gen):
    """The three terms of eq. C.1 as losses (each a mean over its rows): (labeled CE, unlabeled, generated)."""
    lab = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits_lab), labels[:, None], 1))
    lse_u = jax.nn.logsumexp(logits_unl, -1)
    lse_g = jax.nn.logsumexp(logits_gen, -1)
    unl = jnp.mean(jax.nn.softplus(lse_u) - lse_u)  # -log P(y<=K|x)
    gen = jnp.mean(jax.nn.softplus(lse_g))  # -log P(K+1|x)
    return lab, unl, gen


def conditional_entropy(logits):
    """-Σ_{k<=K} P(k|x) log P(k|x) with P over the K+1 classes (the fake logit 0), mean over rows (eq. C.5)."""
    full = jnp.concatenate([logits, jnp.zeros(logits.shape[:-1] + (1,), logits.dtype)], -1)
    lp = jax.nn.log_softmax(full)[..., :-1]
    return -jnp.mean(jnp.sum(jnp.exp(lp) * lp, -1))


def kplus1_d_loss(logits_lab, labels, logits_unl, logits_gen, ent_weight: float = 0.0):
    """The discriminator's loss, -(eq. C.5); logits [B, K] (labels [B] int)."""
    lab, unl, gen = kplus1_terms(logits_lab, labels, logits_unl, logits_gen)
    loss = lab + unl + gen
    if ent_weight:
        loss = loss + ent_weight * conditional_entropy(logits_unl)
    return loss


def feature_matching(f_gen, f_unl):
    """‖E_G f - E_U f‖² / d: f [B, d]."""
    return jnp.mean((jnp.mean(f_gen, 0) - jnp.mean(f_unl, 0)) ** 2)


def pull_away(f):
    """The pull-away term over a batch f [N, d]."""
    n = f.shape[0]
    u = f / (jnp.linalg.norm(f, axis=-1, keepdims=True) + 1e-8)
    s = (u @ u.T) ** 2
    return (jnp.sum(s) - jnp.sum(jnp.diag(s))) / (n * (n - 1))


def low_density(log_p, log_eps):
    """E[log p(x) I[log p(x) > log ε]] over samples above the threshold (0 if none): log_p [B], log_eps scalar."""
    above = log_p > log_eps
    n = jnp.maximum(jnp.sum(above), 1)
    return jnp.sum(jnp.where(above, log_p - log_eps, 0.0)) / n

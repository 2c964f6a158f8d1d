"""Bounds of the laws a generator draws from (pure constants: no numpy), each with its
reason. Token counts are bounded by `workloads.request.MAX_TOKENS`."""

#: Largest CV of Gamma gaps (shape k = 1/cv^2 >= 0.01). Below that shape numpy's Gamma
#: draws underflow to 0.0 (a draw below 1e-308 has probability ~(1e-308)^k: 0.08% at
#: k = 0.01, 93% at k = 1e-4), so the gaps no longer have the law asked for; the
#: burstiest published fits are far inside it (BurstGPT's Gamma gaps, Wang et al. 2024,
#: arXiv:2401.17644; ServeGen's per-client CVs of 1-3). vLLM's burstiness (the shape)
#: is then at least 0.01.
MAX_GAMMA_CV = 10.0

#: Largest CV of a log-normal length law. sigma^2 = ln(1 + cv^2): at cv = 10 a draw
#: above 10^8 tokens from a 1,000-token mean has probability ~3e-8; at cv = 1e300 sigma
#: is 37 and the draws overflow int64. Published length fits are far inside (ServeGen's
#: per-client CVs of 1-3).
MAX_LOGNORMAL_CV = 10.0

#: Most distinct system prompts a session client draws from: its Zipf weights are one
#: array of that length (agent fleets use a handful to a few hundred).
MAX_SYSTEM_PROMPTS = 100_000

__all__ = ["MAX_GAMMA_CV", "MAX_LOGNORMAL_CV", "MAX_SYSTEM_PROMPTS"]

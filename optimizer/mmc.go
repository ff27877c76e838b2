package optimizer

import "math"

// MMcSojourn is the mean sojourn time (seconds) of an M/M/c queue with arrival rate lambda and
// per-server rate mu1 (requests/s): 1/μ₁ + C(c, λ/μ₁) / (cμ₁ − λ), with C Erlang's C formula;
// +Inf if λ ≥ cμ₁. For c = 1 it is M/M/1's 1/(μ₁ − λ).
func MMcSojourn(lambda, mu1 float64, c int) float64 {
	cf := float64(c)
	if lambda >= cf*mu1 {
		return math.Inf(1)
	}
	a := lambda / mu1 // offered load, erlangs
	b := 1.0          // Erlang B, by its recursion over the servers
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	wait := b / (1 - a/cf*(1-b)) // Erlang C: the probability of waiting
	return 1/mu1 + wait/(cf*mu1-lambda)
}

#include "train/sol.h"


namespace qtrain {

double training_flops_per_token(const ModelConfig& c, int seq_len) {
    const double h = c.hidden_size, q = c.q_dim(), kv = c.kv_dim(), i = c.intermediate_size, v = c.vocab_size;
    const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * i;
    const double matmul_params = c.num_hidden_layers * per_layer + v * h;  // LM head always a matmul
    const double attention = 6.0 * c.num_hidden_layers * seq_len * q;
    return 6.0 * matmul_params + attention;
}

}  // namespace qtrain

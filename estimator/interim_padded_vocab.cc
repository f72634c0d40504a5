// INTERIM until branch `inventory` lands PaddedVocab on main; delete on merge.
#include "preflight/inventory.h"

namespace preflight {

int64_t PaddedVocab(const ModelConfig& m, int64_t tp) { return RoundUp(m.vocab, CheckedMul(m.vocab_pad_multiple, tp)); }

}  // namespace preflight

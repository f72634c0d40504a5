#include "preflight/inventory/inventory.h"

namespace preflight {

const char* Name(Split s) {
  switch (s) {
    case Split::kReplicated: return "replicated";
    case Split::kTpColumn: return "tp-column";
    case Split::kTpRow: return "tp-row";
    case Split::kTpChannel: return "tp-channel";
    case Split::kVocab: return "vocab-parallel";
    case Split::kExpert: return "expert";
  }
  return "?";
}

int FamilyIndex(BlockKind k) {
  switch (k) {
    case BlockKind::kAttention: return 0;
    case BlockKind::kMamba: return 1;
    case BlockKind::kMoe: return 2;
    case BlockKind::kRecurrent: return 3;
    case BlockKind::kDenseMlp: return 4;
  }
  return 0;
}

}  // namespace preflight

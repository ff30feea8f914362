// The DFlash block drafter (arXiv 2602.06036; the z-lab/dflash checkpoints for Qwen3 targets):
// a few Qwen3-style decoder layers that read the target's hidden states at chosen layers (the
// hidden-state tap) and propose a whole block in one forward. The block is the target's last
// token followed by mask tokens; the drafter's output at each mask position is its guess for
// that position, so a block of B positions proposes B - 1 tokens at once. The drafter has no
// embedding or LM head of its own: it borrows the target's.
//
// Per layer, the queries come from the block; the keys and values are the context's (the fused
// target states, cached: only committed positions ever enter the cache, so nothing is rolled
// back) followed by the block's own (not cached). The attention is not causal.
#pragma once

#include <filesystem>
#include <memory>
#include <vector>

#include "models/model.h"
#include "nn/transformer.h"

namespace lmx {

struct DFlashConfig {
  int hidden_size = 0;
  int num_hidden_layers = 0;  // the drafter's own layers
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  float rms_norm_eps = 1e-6f;
  int block_size = 0;                 // positions per drafted block: block_size - 1 proposals
  int num_target_layers = 0;          // the target's decoder layer count
  std::vector<int> target_layer_ids;  // target layers (0-based) whose outputs are fused, in order
  int mask_token_id = 0;
  nn::RoPE rope;
};

// Whether `dir`'s config.json describes a DFlash drafter (a "dflash_config" object, or the
// "DFlashDraftModel" architecture).
bool is_dflash_checkpoint(const std::filesystem::path& dir);

class DFlashDrafter {
 public:
  // config.json + *.safetensors of a z-lab DFlash drafter; every tensor is checked by name and
  // shape (`[dir] tensor 'fc.weight' has shape [64, 96], expected [64, 128]`).
  static std::shared_ptr<DFlashDrafter> load(const std::filesystem::path& dir);

  const DFlashConfig& config() const { return cfg_; }
  // Checks that `target` is the model this drafter was made for: its layer count, hidden size
  // (through its embedding) and vocabulary (through its head).
  void check_target(const Model& target) const;
  // One KVCache per drafter layer, holding the context's keys and values.
  Cache make_cache() const;

  // block: (1, L) token ids ([last token, mask...]); context: (1, S, taps * hidden), the fused
  // target states of the S positions after those already in `cache` (S may be 0), appended to
  // it. -> logits (1, L, vocab) through the target's head.
  mx::array operator()(const Model& target, const mx::array& block, const mx::array& context,
                       Cache& cache) const;

 private:
  struct Layer {
    nn::Linear q_proj, k_proj, v_proj, o_proj;
    nn::RMSNorm q_norm, k_norm, input_layernorm, post_attention_layernorm;
    nn::SwiGLUMLP mlp;
  };
  DFlashDrafter(DFlashConfig cfg, WeightStore& w);
  mx::array attention(const Layer& l, const mx::array& x, const mx::array& ctx,
                      KVCacheBase& cache) const;

  DFlashConfig cfg_;
  nn::Linear fc_;
  nn::RMSNorm hidden_norm_, norm_;
  std::vector<Layer> layers_;
  std::string source_;
};

}  // namespace lmx

// all-MiniLM-L6-v2's weights, loaded through devbuf's safetensors loader, and its forward
// pass as a graph of kernels on the compute queue (kernels.h).
#ifndef EMBED_MODEL_H
#define EMBED_MODEL_H

#include "kernels.h"

#include <stddef.h>

typedef struct embed_layer {
  devbuf_buffer_t *query_w, *query_b, *key_w, *key_b, *value_w, *value_b; // self-attention
  devbuf_buffer_t *out_w, *out_b, *norm1_g, *norm1_b;                     // its output
  devbuf_buffer_t *up_w, *up_b, *down_w, *down_b, *norm2_g, *norm2_b;     // feed-forward
  // Views of up_w and up_b: the rows (outputs) of each of the feed-forward layer's parts.
  devbuf_buffer_t *up_w_part[EMBED_FFN_PARTS], *up_b_part[EMBED_FFN_PARTS];
} embed_layer_t;

typedef struct embed_model {
  devbuf_buffer_t *word, *position, *type, *norm_g, *norm_b; // embeddings
  embed_layer_t layers[EMBED_LAYERS];
  uint64_t weight_bytes; // of the tensors above
  bool zero_copy;        // every tensor is a view of one mapping of the file (checked)
  size_t max_tokens;     // a sequence's most tokens, [CLS] and [SEP] included
} embed_model_t;

// 0 if `dir` is a folder; otherwise -1 with "model folder 'DIR': <reason>" in `err`.
int embed_model_folder(const char *dir, char *err, size_t err_size);

// Checks the folder's settings (model_config.c): config.json must describe this model (BERT,
// hidden 384, 12 heads, 6 layers, feed-forward 1536, 30522 ids, 512 positions, GELU, epsilon
// 1e-12), and sentence-transformers' files mean pooling and normalising; each file that is
// absent is taken as all-MiniLM-L6-v2's. *out_max_tokens: sentence_bert_config.json's
// max_seq_length (2 to EMBED_MAX_TOKENS), or EMBED_MAX_TOKENS. 0, or -1 with a message
// naming the file, key, value found and value needed in `err`.
int embed_model_check_settings(const char *dir, size_t *out_max_tokens, char *err, size_t err_size);

// Checks the settings (above), loads DIR/model.safetensors onto `device` and checks every
// tensor the model uses: its dtype (F32) and shape, and where it lives: on a CPU-accessible
// device a read-only view of the mapped file (zero-copy, unless a tensor sits at an offset
// misaligned for floats: the loader copies those, and then the model is not zero-copy),
// elsewhere memory of the device's allocator; a file with more layers than the model's is
// refused. 0 on success; otherwise -1 with a one-line message in `err`.
int embed_model_load(devbuf_device_t *device, const char *dir, embed_model_t **out_model, char *err,
                     size_t err_size);
void embed_model_free(embed_model_t *model);

// Submits the forward pass of `seqs` sequences of `tokens` tokens each to x->compute: ids
// and mask hold seqs x tokens values (written by earlier work), `embeddings` gets seqs x 384
// floats, the L2-normalised embeddings, once the work is done. Activations are buffers of
// the device's allocator holding `capacity` rows (>= seqs x tokens, the same for every
// batch, so that every batch asks the allocator for the same sizes), each released right
// after the submission of its last reader.
devbuf_status embed_model_forward(const embed_model_t *model, embed_exec_t *x, devbuf_buffer_t *ids,
                                  devbuf_buffer_t *mask, devbuf_buffer_t *embeddings, size_t seqs,
                                  size_t tokens, size_t capacity);

#endif // EMBED_MODEL_H

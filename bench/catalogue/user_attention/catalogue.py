"""User-written attention classes, as plain data: which file holds which class, whether it is correct, and for a
buggy one the one mistake it makes and which property of correct attention that mistake breaks.

The classes were written from tutorials, textbooks and library code (see README.md) by someone who had not read
the product's checks; the categories below are properties of attention itself, not names of the product's checks.

Categories (what a correct self-attention layer in a text classifier satisfies, and a mistake can break):
    scale            the scores are Q Kᵀ / √d_k with d_k the width of one head: no other factor (none at all, 1/d_k,
                     √d_k, 1/√d_model) multiplies them, so a freshly built layer is neither saturated nor uniform
    softmax-rows     the weights are a softmax over the keys: every entry ≥ 0 and each query's row sums to 1
    padding          a text's result depends on its own real tokens only: padded keys get exactly 0 weight, and its
                     output does not change with more padding or with the other texts in its batch
    mask-convention  the mask is read with one meaning throughout: no key the mask keeps is blocked, and no real
                     token's output is wiped, whatever convention the class documents for its mask
    formula          on a batch without padding, the output (and the weights it hands out) equal
                     softmax(Q Kᵀ / √d_k) V (then W_O), recomputed from the layer's own projection weights
    determinism      in evaluation mode two passes over the same input give the same output
    gradient         every parameter of the layer receives a gradient from its output
    permutation      with no positions inside attention, permuting the tokens permutes the output the same way
    shapes           the output is (batch, seq_len, width) and the weights are (batch, seq_len, seq_len) or
                     (batch, heads, seq_len, seq_len)

Fields of each entry:
    file        the file in this folder (one class, importable on its own: torch, math, numpy only)
    class_name  the class to build
    correct     True: computes self-attention correctly in its own conventions
    args        constructor arguments a product cannot fill from its own width / heads / head-size settings
                (d_model/embed_dim/hidden_size/dim, n_heads/num_heads/num_attention_heads/heads, d_k/d_head/head_dim)
    mistake     one plain sentence: what is wrong (buggy ones only)
    expected    the categories the mistake breaks (empty for correct ones)

How each class takes its mask (keyword, convention, shape) is written in the file's header comment; a product is
meant to find it by probing, so it is not part of this manifest.
"""

CATEGORIES = (
    "scale",
    "softmax-rows",
    "padding",
    "mask-convention",
    "formula",
    "determinism",
    "gradient",
    "permutation",
    "shapes",
)


def _correct(file, class_name, args=None):
    return dict(file=file, class_name=class_name, correct=True, args=args or {}, mistake="", expected=())


def _buggy(file, class_name, mistake, expected, args=None):
    return dict(file=file, class_name=class_name, correct=False, args=args or {}, mistake=mistake, expected=expected)


CATALOGUE = (
    # Correct, one style each.
    _correct("course_self_attention.py", "SelfAttention"),
    _correct("numpy_style_softmax.py", "SelfAttention"),
    _correct("einsum_multihead.py", "MultiHeadAttention"),
    _correct("fused_qkv.py", "Attention"),
    _correct("mha_wrapper.py", "SelfAttention"),
    _correct("bert_self_attention.py", "BertSelfAttention"),
    _correct("sdpa_with_weights.py", "Attention"),
    _correct("key_padding_mask_attention.py", "MultiHeadSelfAttention"),
    _correct("hf_attention_mask.py", "SelfAttention"),
    _correct("annotated_transformer.py", "MultiHeadedAttention", {"h": 4}),
    _correct("lucidrains_attention.py", "Attention", {"dim_head": 8}),
    _correct("nanogpt_style.py", "SelfAttention"),
    # Buggy, one mistake each.
    _buggy(
        "course_no_scale.py",
        "SelfAttention",
        "The scores Q Kᵀ are never divided by √d_k.",
        ("scale", "formula"),
    ),
    _buggy(
        "bert_scale_by_head_size.py",
        "BertSelfAttention",
        "The scores are divided by the head size d_k instead of its square root.",
        ("scale", "formula"),
    ),
    _buggy(
        "lucidrains_scale_power.py",
        "Attention",
        "self.scale is dim_head ** 0.5 instead of dim_head ** -0.5, so the scores are multiplied by √d_k.",
        ("scale", "formula"),
        {"dim_head": 8},
    ),
    _buggy(
        "nanogpt_scale_model_width.py",
        "Head",
        "The scores are scaled by C ** -0.5 with C the model width, not the head size.",
        ("scale", "formula"),
        {"head_size": 8},
    ),
    _buggy(
        "numpy_softmax_axis1.py",
        "SelfAttention",
        "The hand-written softmax normalises over axis 1, the queries of a batched (B, L, L) tensor, not the keys.",
        ("softmax-rows", "formula"),
    ),
    _buggy(
        "fused_qkv_softmax_dim1.py",
        "Attention",
        "softmax(dim=1) normalises over the heads of the (B, H, N, N) scores instead of over the keys.",
        ("softmax-rows", "formula"),
    ),
    _buggy(
        "key_padding_mask_rows.py",
        "MultiHeadSelfAttention",
        "The padding mask is broadcast over the queries (B, 1, L, 1): padded queries are masked, padded keys are not.",
        ("padding",),
    ),
    _buggy(
        "hf_mask_not_inverted.py",
        "SelfAttention",
        "The 1 = token mask is multiplied by -10000 without first computing 1 - mask, so real keys are blocked and "
        "padding is attended, while the output zeroing reads the mask the right way round.",
        ("mask-convention", "padding"),
    ),
    _buggy(
        "einsum_mask_unused.py",
        "MultiHeadAttention",
        "The mask is accepted and reshaped but never applied to the scores.",
        ("padding",),
    ),
    _buggy(
        "mask_after_softmax.py",
        "MultiHeadAttention",
        "Padded keys are zeroed after the softmax and the rows are not renormalised.",
        ("padding", "softmax-rows"),
    ),
    _buggy(
        "annotated_fill_zero.py",
        "MultiHeadedAttention",
        "Masked scores are filled with 0 instead of a large negative number, so padded keys keep weight.",
        ("padding",),
        {"h": 4},
    ),
    _buggy(
        "split_heads_view.py",
        "MultiHeadSelfAttention",
        "Heads are split with view(B, H, L, d_k) without the transpose, mixing tokens and heads.",
        ("formula", "padding", "permutation"),
    ),
    _buggy(
        "bert_merge_heads_view.py",
        "BertSelfAttention",
        "Heads are merged by reshaping (B, H, L, d) to (B, L, H·d) without permuting back, mixing tokens and heads.",
        ("formula", "padding", "permutation"),
    ),
    _buggy(
        "course_key_from_wq.py",
        "SelfAttention",
        "The keys are computed with W_Q instead of W_K (K = Q), and W_K is never used.",
        ("formula", "gradient"),
    ),
    _buggy(
        "raschka_values_skipped.py",
        "SelfAttention",
        "The weights multiply the input x instead of the values x W_value, which is never used.",
        ("formula", "gradient"),
    ),
    _buggy(
        "lucidrains_dropout_eval.py",
        "Attention",
        "F.dropout on the weights is called without training=self.training, so it stays on in evaluation.",
        ("determinism", "formula"),
        {"dim_head": 8},
    ),
    _buggy(
        "sdpa_weights_unmasked.py",
        "Attention",
        "The weights recomputed for display leave out the mask, so they are not the weights the output used.",
        ("padding",),
    ),
    _buggy(
        "scores_returned.py",
        "MultiHeadSelfAttention",
        "The pre-softmax scores (-1e9 on padded keys) are returned as the attention weights.",
        ("softmax-rows", "formula", "padding"),
    ),
    _buggy(
        "hf_transposed_product.py",
        "SelfAttention",
        "The scores are K Qᵀ instead of Q Kᵀ: row i holds key i against every query, the score matrix transposed.",
        ("formula",),
    ),
    _buggy(
        "annotated_masked_fill_discarded.py",
        "MultiHeadAttention",
        "scores.masked_fill(...) is called without assigning its result, so the mask never reaches the scores.",
        ("padding",),
    ),
    _buggy(
        "course_stored_weights_detached.py",
        "SelfAttention",
        "The weights are detached (to keep them for plotting) before they multiply V, so W_Q and W_K get no gradient.",
        ("gradient",),
    ),
    _buggy(
        "numpy_scale_after_softmax.py",
        "SelfAttention",
        "The 1/√d_k factor divides the softmax output instead of the scores, so rows sum to 1/√d_k.",
        ("softmax-rows", "formula"),
    ),
    _buggy(
        "mha_not_batch_first.py",
        "SelfAttention",
        "nn.MultiheadAttention is built without batch_first=True and given (batch, seq_len, dim), so it attends "
        "across the texts of the batch instead of across tokens.",
        ("formula", "padding", "shapes"),
    ),
)

"""A question-level router from SmolLM2-135M's embedding of the question: per family and embedding (middle-layer
mean, last-layer mean, last token), a ridge regression from the standardised embedding to each worker's recorded
score, routing to the argmax. The penalty is chosen by 5-fold cross-validation on the train file (1e12 is family
routing). Scores are read as recorded, as on 2026-11-26 before docs/decisions/007-routerdc-score-reading.md.
    python scripts/routerdc_embedding_router.py [EMBEDDINGS]     (default runs/routerdc_question_embeddings.npz)
EMBEDDINGS is what scripts/routerdc_embed_questions.py wrote. Used by docs/log/2026-11-26-replay-embedding-probe.md
(then named probe.py).
"""

import sys

import numpy as np

from routerdc_files import FAMILIES, records, scores

PENALTIES = [0.1, 1, 10, 100, 1000, 1e4, 1e12]
embeddings = np.load(sys.argv[1] if len(sys.argv) > 1 else "runs/routerdc_question_embeddings.npz")


def fit_predict(X, A, X_test, penalty):
    mean, x_mean = A.mean(0), X.mean(0)
    W = np.linalg.solve((X - x_mean).T @ (X - x_mean) + penalty * np.eye(X.shape[1]), (X - x_mean).T @ (A - mean))
    return (X_test - x_mean) @ W + mean


rng = np.random.default_rng(0)
for kind, name in enumerate(["mid-mean", "last-mean", "last-token"]):
    total = 0.0
    for train, test in FAMILIES:
        A, B = scores(records(train)), scores(records(test))
        mean, std = embeddings[train][:, kind].mean(0), embeddings[train][:, kind].std(0) + 1e-6
        X, X_test = (embeddings[train][:, kind] - mean) / std, (embeddings[test][:, kind] - mean) / std
        folds = rng.permutation(len(A)) % 5
        cross_validated = {
            penalty: sum(
                A[folds == f][np.arange((folds == f).sum()),
                              fit_predict(X[folds != f], A[folds != f], X[folds == f], penalty).argmax(1)].sum()
                for f in range(5)
            ) / len(A)
            for penalty in PENALTIES
        }
        best = max(cross_validated, key=cross_validated.get)
        accuracy = B[np.arange(len(B)), fit_predict(X, A, X_test, best).argmax(1)].mean()
        print(name, test, "penalty", best, "cv", {k: round(100 * float(v), 2) for k, v in cross_validated.items()},
              "test", round(100 * accuracy, 2), "family", round(100 * B[:, A.mean(0).argmax()].mean(), 2))
        total += accuracy
    print(name, "average", round(100 * total / 5, 3))

"""A question-level router on the RouterDC files: per family, kernel ridge regression from a hashed bag of words of
the question (16k features, log counts, unit norm) to each worker's recorded score, routing to the argmax. The penalty
is chosen by 5-fold cross-validation on the train file (1e9 is family routing); prints each family's cross-validated
accuracies, its test accuracy and family routing's, then the averages over the five test files.

Scores are read as recorded (a multiple-choice score is the right option's probability when the answer was right);
the run of 2026-11-25 used this reading.
    python scripts/routerdc_bag_of_words_router.py
Reads the RouterDC files from the data lookup (`python -m launch.data fetch routerdc`); 1-5 minutes on 2 cores. Used by
docs/log/2026-11-25-replay-router-ceiling.md (then named bowcv.py). Replacing the cross-validated penalty by 30
reproduces the test-tuned 53.32 of docs/log/2026-11-24-replay-routing-ceiling.md.
"""

import re
import zlib

import numpy as np

from routerdc_files import FAMILIES, records, scores

FEATURES = 2**14
PENALTIES = [1, 3, 10, 30, 100, 300, 1e9]


def features(question: str) -> np.ndarray:
    x = np.zeros(FEATURES)
    for token in re.findall(r"\w+|[^\w\s]", question.lower()):
        x[zlib.crc32(token.encode()) % FEATURES] += 1
    x = np.log1p(x)
    norm = np.linalg.norm(x)
    return x / norm if norm else x


def fit_predict(X, A, X_test, penalty):
    mean = A.mean(0)
    alpha = np.linalg.solve(X @ X.T + penalty * np.eye(len(X)), A - mean)
    return X_test @ X.T @ alpha + mean


total = family_total = 0.0
rng = np.random.default_rng(0)
for train, test in FAMILIES:
    a, b = records(train), records(test)
    A, B = scores(a), scores(b)
    X = np.stack([features(r["question"]) for r in a])
    X_test = np.stack([features(r["question"]) for r in b])
    folds = rng.permutation(len(a)) % 5
    cross_validated = {}
    for penalty in PENALTIES:
        right = 0.0
        for f in range(5):
            predicted = fit_predict(X[folds != f], A[folds != f], X[folds == f], penalty)
            right += A[folds == f][np.arange((folds == f).sum()), predicted.argmax(1)].sum()
        cross_validated[penalty] = right / len(a)
    best = max(cross_validated, key=cross_validated.get)
    accuracy = B[np.arange(len(B)), fit_predict(X, A, X_test, best).argmax(1)].mean()
    family = B[:, A.mean(0).argmax()].mean()
    print(test, "cv-penalty", best, "cv", {k: round(100 * float(v), 2) for k, v in cross_validated.items()},
          "test", round(100 * float(accuracy), 2), "family", round(100 * float(family), 2))
    total += accuracy
    family_total += family
print("average", round(100 * float(total) / 5, 2), "family", round(100 * float(family_total) / 5, 2))

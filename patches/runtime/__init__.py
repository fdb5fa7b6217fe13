"""Our own run-time module that apply-patches copies into the checkout as face_model/gpen_tune_runtime.py."""

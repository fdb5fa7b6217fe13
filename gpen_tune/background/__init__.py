"""Work on the whole frame around the faces: the background upscaler (`gpen_tune.background.upscale`)."""

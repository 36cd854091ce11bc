#pragma once

int LibValue();

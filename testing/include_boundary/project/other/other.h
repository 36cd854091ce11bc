#pragma once

int OtherValue();
